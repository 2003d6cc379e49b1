package leantier;

import java.util.concurrent.atomic.AtomicLong;

import quickfix.*;
import quickfix.field.*;
import quickfix.fix44.ExecutionReport;
import quickfix.fix44.NewOrderSingle;

/**
 * The equivalent of QuickFIX/J's "Executor" example (not published as a jar): a FIX 4.4
 * acceptor that acknowledges every NewOrderSingle and fills it in full at its price. The peer
 * of leantier's acceptor in the FIX benchmark (scripts/bench-fix). Like leantier's acceptor, it
 * refuses a Logon whose Password (554) is not the configured one (compared in plain text: once
 * per logon, outside what the benchmark measures).
 * Usage: Executor PORT SENDER_COMP_ID TARGET_COMP_ID PASSWORD STORE_DIR
 */
public final class Executor extends MessageCracker implements Application {
    private final AtomicLong ids = new AtomicLong();
    private final String password;

    private Executor(String password) {
        this.password = password;
    }

    @Override public void onCreate(SessionID id) {}
    @Override public void onLogon(SessionID id) {}
    @Override public void onLogout(SessionID id) {}
    @Override public void toAdmin(Message message, SessionID id) {}

    @Override
    public void fromAdmin(Message message, SessionID id) throws FieldNotFound, RejectLogon {
        boolean logon = MsgType.LOGON.equals(message.getHeader().getString(MsgType.FIELD));
        if (logon && !(message.isSetField(Password.FIELD) && password.equals(message.getString(Password.FIELD)))) {
            throw new RejectLogon("bad password");
        }
    }

    @Override public void toApp(Message message, SessionID id) {}

    @Override
    public void fromApp(Message message, SessionID id) throws FieldNotFound, IncorrectTagValue, UnsupportedMessageType {
        crack(message, id);
    }

    @Handler
    public void onMessage(NewOrderSingle order, SessionID id) throws FieldNotFound {
        double qty = order.getOrderQty().getValue();
        double price = order.isSetPrice() ? order.getPrice().getValue() : 0;
        send(report(order, ExecType.NEW, OrdStatus.NEW, qty, 0, 0), id);
        ExecutionReport fill = report(order, ExecType.TRADE, OrdStatus.FILLED, 0, qty, price);
        fill.set(new LastQty(qty));
        fill.set(new LastPx(price));
        send(fill, id);
    }

    private ExecutionReport report(NewOrderSingle order, char execType, char status, double leaves, double cum, double avg)
            throws FieldNotFound {
        long n = ids.incrementAndGet();
        ExecutionReport report = new ExecutionReport(new OrderID(Long.toString(n)), new ExecID(Long.toString(n)),
            new ExecType(execType), new OrdStatus(status), order.getSide(), new LeavesQty(leaves), new CumQty(cum), new AvgPx(avg));
        report.set(order.getClOrdID());
        report.set(order.getSymbol());
        report.set(order.getOrderQty());
        return report;
    }

    private static void send(Message message, SessionID id) {
        try {
            Session.sendToTarget(message, id);
        } catch (SessionNotFound e) {
            // The session logged out meanwhile; nothing to answer.
        }
    }

    public static void main(String[] args) throws Exception {
        SessionID id = new SessionID("FIX.4.4", args[1], args[2]);
        SessionSettings settings = new SessionSettings();
        settings.setString(id, "ConnectionType", "acceptor");
        settings.setString(id, "SocketAcceptPort", args[0]);
        settings.setString(id, "StartTime", "00:00:00");
        settings.setString(id, "EndTime", "00:00:00");
        settings.setString(id, "NonStopSession", "Y");
        settings.setString(id, "UseDataDictionary", "Y");
        settings.setString(id, "DataDictionary", "FIX44.xml");
        // Like leantier's acceptor: sent messages and sequence numbers go to files, so a restart
        // can resend; synced before sending when the sixth argument is Y (leantier's
        // store_sync), written only otherwise (the default).
        settings.setString(id, "FileStorePath", args[4]);
        settings.setString(id, "FileStoreSync", args.length > 5 ? args[5] : "N");
        Acceptor acceptor = new SocketAcceptor(new Executor(args[3]), new FileStoreFactory(settings), settings,
            new ScreenLogFactory(false, false, false), new DefaultMessageFactory());
        acceptor.start();
        System.out.println("Executor listening on " + args[0]);
        Thread.currentThread().join();
    }
}
